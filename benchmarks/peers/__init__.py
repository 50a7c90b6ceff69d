"""Side-by-side comparison with llama.cpp's `llama-server` (issue 16 item 4): build it from the
llama-cpp-python sdist (build_llama), convert the demo checkpoint to GGUF (gguf_convert), serve
both one after the other (servers) under `spmd_serve bench`, and print the ratios (ratios, compare).
Run by a developer, not in CI: `python -m benchmarks.peers.compare --demo small`."""
