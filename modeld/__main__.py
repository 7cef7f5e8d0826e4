from modeld.front.server import main

main()
