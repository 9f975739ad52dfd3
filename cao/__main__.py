from cao.cli import main

main()
