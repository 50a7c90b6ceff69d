"""Anthropic's Messages API (`/v1/messages`, as vLLM and SGLang serve it): a body as the chat request
it asks for (request), the answer's shapes (format), the routes (handler)."""
