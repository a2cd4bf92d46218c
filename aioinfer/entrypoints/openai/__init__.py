"""The OpenAI-compatible HTTP API (Quart): request models, routes, SSE, errors."""
