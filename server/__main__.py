from server.commands import main

raise SystemExit(main())
