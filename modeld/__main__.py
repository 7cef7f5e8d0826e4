from modeld.server import main

main()
