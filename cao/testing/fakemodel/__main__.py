"""``python -m cao.testing.fakemodel``: serve the fake model (see the package docstring)."""

from cao.testing.fakemodel.server import main

main()
