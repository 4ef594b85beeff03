"""Feature flags: the flagd-format flag file (:mod:`.flagd`) and OpenFeature evaluation (:mod:`.evaluate`)."""
