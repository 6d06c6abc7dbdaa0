"""What goes between the agent and its workers on one node: small mapped files.

control.py (the in_place control channel: assignments down, reports up), beats.py (progress
beats: the step a worker reached and when). Both sides read these formats: the agent and
nodeagent.worker (which never imports anything else of the agent).
"""
