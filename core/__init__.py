"""What both apps share: the application error and its handler, the append-only model base, the strict
serializer, request-body parsing, pagination and the master-key middleware. It imports neither app."""
