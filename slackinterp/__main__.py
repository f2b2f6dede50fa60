from slackinterp.cli import main

raise SystemExit(main())
