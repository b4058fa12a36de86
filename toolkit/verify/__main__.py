from toolkit.verify import main

raise SystemExit(main())
