return { name = "same", from = "a", select = function() end }
