"""The bridge service: topics a user already has, in their own format, into device topics, exactly once."""
