"""pylib — the helpers every Python test suite imports (tests/pytest.ini puts tests/ on
the path): common (binaries, folders, exit code 77), server (a real `ddpd serve`, /proc,
waits, job specs, streams), safetensors (read and write the format), parity (data,
`ddpd run`, the PyTorch reference trainer), ddp (multi-rank runs and PyTorch DDP), slurm
(the Slurm cluster). Fixtures are declared by each suite's conftest.py."""
