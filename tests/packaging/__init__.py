"""The release check behind ``make package``."""
