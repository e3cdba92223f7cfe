return {
    name = "same", from = "b", select = function() end }
