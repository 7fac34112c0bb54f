from hpctf.cli import main

main()
