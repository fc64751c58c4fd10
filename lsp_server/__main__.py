"""`python -m lsp_server` runs the `draftline` CLI."""

from lsp_server.cli import main

raise SystemExit(main())
