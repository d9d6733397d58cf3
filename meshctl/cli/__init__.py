"""The `meshctl` command line."""
