// The memgrad command line (placeholder entry until the subcommands are wired).
int main() { return 0; }
