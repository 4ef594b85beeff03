"""Progressive rollouts of releases and flags: the model (:mod:`.model`), the interfaces the
controller drives (:mod:`.interfaces`: the rollout target's nodes and the signals, with an injected
clock), the controller (:mod:`.controller`), its write-ahead store (:mod:`.store`), flag rollouts
(:mod:`.flag`), person decisions (:mod:`.decisions`), drift (:mod:`.drift`), notices
(:mod:`.notices`), tracing (:mod:`.tracing`), a rollout's text/JSON report (:mod:`.report`) and
``adapters/`` that wire them to a stack."""
