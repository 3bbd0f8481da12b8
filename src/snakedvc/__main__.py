from snakedvc.cli import main

raise SystemExit(main())
