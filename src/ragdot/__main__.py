from ragdot.cli import main

raise SystemExit(main())
