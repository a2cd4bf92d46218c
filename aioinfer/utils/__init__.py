"""Small helpers with vLLM's module paths (``aioinfer.utils.argparse_utils``), for scripts ported from it."""
