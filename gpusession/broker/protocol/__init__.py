"""What travels between a caller and the broker: a lease request, a notice."""
