"""What goes between the agent and its workers on one node: small files, one owner module per
format, which both sides import (the agent, and nodeagent.worker, which imports nothing else of
the agent).

control.py (the in_place control channel: assignments down, reports up), beats.py (progress
beats: the step a worker reached and when), and the checkpoint tiers: tier.py (where the tiers
lie), manifests.py (what makes a rank's save whole: manifest, checksums, verify, copy),
beneath.py (how the root agent opens a tier's files: below its own directory, no link
followed, only the tier owner's),
restore.py (the leader's restore order, the worker's restore report and its refusal kinds),
pin.py (the committed save no save or copy goes over), fetching.py (the note that the agent
brings a restore's saves from peers), layout.py (which old ranks a rank of another world reads).
"""
