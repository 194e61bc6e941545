def main() -> int:
    print("stub")
    return 0
