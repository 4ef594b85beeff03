"""Node-action adapters of the remediation controller: the simulator's admin API and Kubernetes."""
