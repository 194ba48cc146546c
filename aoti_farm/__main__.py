from aoti_farm.cli import main

raise SystemExit(main())
