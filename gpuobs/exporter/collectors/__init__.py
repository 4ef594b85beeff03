"""One collector per page: the DCGM page (:mod:`.dcgm`), the vLLM engine page (:mod:`.vllm`) and
training ranks (:mod:`.training`)."""
