from flashinfer.mla._core import trtllm_batch_decode_with_kv_cache_mla  # noqa: F401


class BatchMLAPagedAttentionWrapper:
    """The wrapper the flashinfer pack probes (run); not used by these cases."""

    def run(self, q_nope=None, q_pe=None, ckv_cache=None, kpe_cache=None, *args, **kwargs):
        raise NotImplementedError("stand-in")
