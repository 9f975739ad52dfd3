"""End-to-end tests of the real agent CLIs, driven through cao-server inside a loopback-only bed."""
