"""What users call: the offline ``LLM`` (vLLM's API), the command line (``serve``, ``generate``,
``chat``, ``fetch``) and the OpenAI-compatible server (``openai/``). The top of the stack: it may
import every room below and nothing imports it."""
