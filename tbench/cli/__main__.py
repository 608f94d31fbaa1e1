"""`python -m tbench.cli ...`: the same as the `tbench ...` console script."""

from tbench.cli import main

if __name__ == "__main__":
    main()
