"""The Flower ClientApp: local training and evaluation on a client's partition."""
