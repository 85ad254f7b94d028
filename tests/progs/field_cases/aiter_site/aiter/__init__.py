"""Stand-in of the aiter package: only the names the shipped packs look up at import."""


def get_mla_metadata_v1(*args, **kwargs):
    """aiter.get_mla_metadata_v1 (the MLA plan; not used by these cases)."""
    raise NotImplementedError("stand-in")
