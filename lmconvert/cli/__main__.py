from lmconvert.cli import main

main()
