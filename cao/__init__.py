"""cao — run CLI coding agents side by side in tmux and let them talk through a durable inbox."""

__version__ = "0.1.0"
