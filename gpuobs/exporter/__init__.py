"""GPU metric sources (simulated fleet, NVML), collectors and the HTTP/admin server."""
