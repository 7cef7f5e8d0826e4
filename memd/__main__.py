from memd.server import main

main()
