"""SGLang's native `/generate` API: a body as the completions request it asks for (request), the
route and SGLang's output shapes (handler)."""
