from mlatrace.cli import main

main()
