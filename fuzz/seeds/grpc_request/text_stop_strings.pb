Once upon a time*
The end 2