from services.executor.main import main

raise SystemExit(main())
