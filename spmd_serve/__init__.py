"""spmd_serve: an MPI-launched SPMD LLM server for PaddlePaddle static-graph models."""

__version__ = "0.1.0"
