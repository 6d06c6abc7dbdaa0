"""Other fault-tolerance systems, run by bench/recovery.py beside nodeagent on the same faults.

torchft_train.py is the workload as torchft runs it (in torchft's own virtual environment);
torchft_launch.py starts its lighthouse and replica groups for the harness. dlrover_train.py
and dlrover_launch.py are the same for DLRover (its venv, its job master, dlrover-run a node).
"""
