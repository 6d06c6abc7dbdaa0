"""`python -m nodeagent.cli.ctl`: nodeagentctl."""

from nodeagent.cli.ctl.nodeagentctl import main

raise SystemExit(main())
