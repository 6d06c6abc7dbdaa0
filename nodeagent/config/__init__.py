"""A node's config: read once, validated, frozen.

settings.py (the frozen dataclasses), load.py (YAML and documents -> settings; every invalid
value named by its dotted key), poolconfig.py (the pool: section), values.py (the value rules
every section shares), hosts.py (facts of this host: users, groups, addresses; injected),
identity.py (who workers run as), checkpoint.py (job.checkpoint: the checkpoint tiers'
settings), container.py (job.container, as pyxis spells image and mounts, and the node's
containers: section with the reason it refuses one), isolation.py (the node's isolation:
section, a job's memory ask), keyfile.py (the pool's keys:
pool.tokens.key_file, pool.notify.key_file, pool.accounting.password_file), database.py (the
accounting database a URL names), api.py (the API service's config file),
redisurl.py, entrypoint.py, strictyaml.py. Settings are made here and nowhere else; the
environment comes in from the edges (cli/ passes os.environ to the checks, runtime/ hands the
workers theirs and reads what systemd gives the service: RUNTIME_DIRECTORY, NOTIFY_SOCKET).
"""
