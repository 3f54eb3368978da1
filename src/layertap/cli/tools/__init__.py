"""One module per subcommand; each defines a small Tool subclass."""
