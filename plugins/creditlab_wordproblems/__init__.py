"""Real arithmetic word problems for the real model: shipped GSM8K and SVAMP problems of one to
three steps, their gold steps, and a step oracle that judges a model's steps by them."""
