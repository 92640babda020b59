from harness.frontend.cli import main

main()
