from nodeagent.cli.daemon import main

raise SystemExit(main())
