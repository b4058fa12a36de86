from toolkit.verify.command import main

raise SystemExit(main())
