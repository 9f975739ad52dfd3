from cao.mcp.server import main

main()
