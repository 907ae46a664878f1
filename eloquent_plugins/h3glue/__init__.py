"""The aioquic glue: ``common`` (what the server and the client both need, and every helper that reaches into
aioquic's private attributes) and ``listener`` (the server's hardened ``QuicServer``; the client never loads
it). Import from the module itself: this package re-exports nothing, so importing one loads nothing else."""
