"""The operator's commands around `mpirun ... spmd_serve` (CONTRACT §1): `start_server` (start.py),
`stop_server` (stop.py), the per-rank log redirection (rank_output.py) and the bookkeeping both
commands share: the pid file and finding a job's processes (jobs.py).  `download_model` lives in
`spmd_serve.download`."""
