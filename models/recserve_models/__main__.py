"""`python -m recserve_models <command> [options]`: runs `recserve_models.commands.main`."""

from __future__ import annotations

from .commands import main

if __name__ == "__main__":
    main()
