"""Prompts made from templates: multi-step math word problems (GSM8K-like in form, numbers drawn at random;
the target writes the solutions) and everyday chat / writing / advice requests over a topic list, and the
follow-up turns of multi-turn prompts. Everything here is the project's own text."""

import random

NAMES = ["Aisha", "Ben", "Carlos", "Dana", "Elif", "Farid", "Grace", "Hiro", "Ines", "Jamal", "Kofi", "Lena", "Mateo",
         "Nora", "Omar", "Priya", "Quinn", "Rosa", "Sam", "Tariq", "Uma", "Victor", "Wen", "Ximena", "Yusuf", "Zoe",
         "Liam", "Mia", "Noah", "Olivia", "Ethan", "Sofia", "Lucas", "Amara", "Ravi", "Hana", "Diego", "Freya"]
ITEMS = [("apple", "apples"), ("book", "books"), ("pencil", "pencils"), ("cookie", "cookies"), ("sticker", "stickers"),
         ("marble", "marbles"), ("cupcake", "cupcakes"), ("card", "cards"), ("toy car", "toy cars"), ("shell", "shells"),
         ("egg", "eggs"), ("orange", "oranges"), ("comic", "comics"), ("plant", "plants"), ("candle", "candles")]
SHOPS = ["bakery", "bookshop", "market", "toy store", "garden centre", "stationery shop", "farm stand", "cafe"]
JOBS = ["painting a fence", "baking bread", "sorting letters", "knitting scarves", "packing boxes", "planting trees"]


def _n(rng: random.Random, lo: int, hi: int) -> int:
    return rng.randint(lo, hi)


def math_problem(rng: random.Random) -> str:
    a, b = rng.sample(NAMES, 2)
    item, items = rng.choice(ITEMS)
    x, y, z = _n(rng, 3, 60), _n(rng, 2, 25), _n(rng, 2, 12)
    price, price2 = rng.choice([0.25, 0.5, 0.75, 1.2, 1.5, 2, 2.5, 3, 4.25, 5, 7.5, 12]), _n(rng, 2, 40)
    pct = rng.choice([10, 15, 20, 25, 30, 40, 50, 60, 75])
    speed, hours = _n(rng, 20, 90), rng.choice([1.5, 2, 2.5, 3, 4, 5])
    forms = [
        f"{a} has {x} {items}. {b} gives {a} {y} more, and then {a} shares them equally among {z} friends. How many "
        f"{items} does each friend get, and how many are left over?",
        f"A {rng.choice(SHOPS)} sells {items} for ${price} each. {a} buys {x} of them and pays with a ${price2 * 5} "
        f"bill. How much change does {a} get?",
        f"{a} reads {y} pages a day. The book has {x * 10} pages. After {z} days, how many pages are left, and how "
        f"many more days will it take to finish?",
        f"A train travels at {speed} km per hour for {hours} hours, then at {speed + y} km per hour for {z} hours. "
        f"How far does it travel in total, and what is its average speed?",
        f"A jacket costs ${price2 * 10}. It is on sale for {pct}% off, and then a further {rng.choice([5, 10, 15])}% "
        f"is taken off the sale price. What is the final price?",
        f"{a} is {z} years older than {b}. In {y} years, the sum of their ages will be {2 * y + z + 2 * x}. How old "
        f"is each of them now?",
        f"{a} and {b} are {JOBS[x % len(JOBS)]}. {a} can finish the job alone in {z} hours and {b} in {z + y} hours. "
        f"How long does it take if they work together?",
        f"A rectangle has a perimeter of {2 * (x + y)} cm and one side is {x} cm long. What is its area? What would "
        f"the area be if both sides were doubled?",
        f"In a class of {x + y + z} students, {x} play football, {y} play chess and {min(x, y) // 2} play both. How "
        f"many play neither?",
        f"{a} saves ${y} every week. {b} starts with ${x} and saves ${z} every week. After how many weeks will "
        f"{a} have more money than {b}?",
        f"A recipe needs {z} eggs for {y} cookies. How many eggs are needed for {y * x} cookies? If eggs come in "
        f"boxes of 6, how many boxes should {a} buy?",
        f"A tank holds {x * 10} litres. It is filled at {y} litres per minute while {z} litres per minute leak "
        f"out. How long does it take to fill the empty tank?",
        f"{a} bought {x} {items} at ${price} each and sold them all at ${round(price * (1 + pct / 100), 2)} each. "
        f"What was the profit, and what percentage profit is that?",
        f"The population of a town is {x * 1000}. It grows by {pct // 5}% each year. What will it be after {z % 5 + 2} "
        f"years? Show your working.",
        f"A bag has {x} red, {y} blue and {z} green marbles. If {a} picks one marble at random, what is the "
        f"probability that it is not blue? What if two marbles are picked without replacement and both are red?",
        f"{a} walks {y} km north, then {z} km east, then {y + z} km south. How far is {a} from the starting point?",
        f"Solve for x: {z}x + {y} = {x}x - {z * y}. Explain each step.",
        f"The average of {z} numbers is {x}. When one more number is added, the average becomes {x + 2}. What is "
        f"the number that was added?",
        f"A farmer has chickens and cows. There are {x + y} heads and {2 * x + 4 * y} legs in total. How many "
        f"chickens and how many cows are there?",
        f"{a} earns ${price2} an hour and works {z + 20} hours a week. Tax takes {pct // 2}% of the pay. How much "
        f"does {a} take home in {rng.choice([2, 4, 52])} weeks?",
        f"A pizza is cut into {z + 4} equal slices. {a} eats {z // 3 + 1} slices and {b} eats a third of what is "
        f"left. What fraction of the pizza remains?",
        f"It takes {z} workers {y} days to build a wall. How many days would it take {z + x % 7 + 1} workers, "
        f"working at the same rate?",
        f"A shop sells {items} in packs of {z} for ${price2} or singly for ${round(price2 / z * 1.3, 2)}. {a} "
        f"needs {x} {items}. What is the cheapest way to buy them?",
        f"What is {x}% of {y * 40}? Then what number is {pct}% larger than that?",
        f"A clock shows {z % 12 + 1}:{rng.choice(['00', '15', '30', '45'])}. What is the angle between the hour and "
        f"minute hands?",
        f"{a} rolls two fair dice. What is the probability that the sum is {z % 11 + 2}? Explain.",
        f"The sum of three consecutive {'even' if x % 2 else 'odd'} numbers is {3 * (2 * x + 1) + (3 if x % 2 else 0)}. "
        f"What are the numbers?",
        f"A car uses {z / 2 + 3} litres of fuel per 100 km. Fuel costs ${round(price / 2 + 1, 2)} per litre. How much "
        f"does a {speed * 10} km trip cost?",
    ]
    return rng.choice(forms)


TOPICS = [
    "photosynthesis", "the French Revolution", "black holes", "compound interest", "the immune system", "machine learning",
    "volcanoes", "the Roman Empire", "climate change", "prime numbers", "jazz", "the printing press", "DNA",
    "electric cars", "the water cycle", "supply and demand", "chess", "the moon landing", "antibiotics", "recursion",
    "the stock market", "honey bees", "the Silk Road", "quantum computing", "coffee", "the Olympic Games",
    "earthquakes", "social media", "vaccines", "the internet", "renewable energy", "the human brain", "ancient Egypt",
    "inflation", "coral reefs", "sleep", "democracy", "the solar system", "bread baking", "public transport",
    "the Renaissance", "rainforests", "cryptography", "friendship", "time management", "ocean tides", "nuclear power",
    "the Great Wall of China", "gardening", "satellites", "evolution", "hash tables", "sorting algorithms",
    "the Cold War", "marathon running", "plastic pollution", "opera", "the periodic table", "remote work", "dinosaurs",
    "meditation", "budgeting", "learning a new language", "public speaking", "job interviews", "composting",
    "electric guitars", "the history of writing", "3D printing", "bicycles", "urban planning", "recycling",
    "mountain climbing", "tea ceremonies", "origami", "the metric system", "blood types", "rainbows", "glaciers",
    "sharks", "octopuses", "wolves", "elephants", "migratory birds", "mushrooms", "bamboo", "cacti", "deserts",
    "the Amazon river", "the Sahara", "Antarctica", "the Industrial Revolution", "the Vikings", "the Aztecs",
    "the Ottoman Empire", "the Meiji era", "the Harlem Renaissance", "impressionist painting", "film noir",
    "hip hop", "classical music", "video game design", "board games", "photography", "podcasting", "journalism",
    "copyright", "privacy online", "password security", "open source software", "databases", "APIs",
    "version control", "unit testing", "cloud computing", "operating systems", "computer networks", "compilers",
    "neural networks", "statistics", "probability", "geometry", "calculus", "linear algebra", "graph theory",
    "game theory", "behavioural economics", "minimum wage", "taxes", "insurance", "mortgages", "retirement savings",
    "small businesses", "marketing", "customer service", "negotiation", "leadership", "teamwork", "procrastination",
    "habits", "nutrition", "hydration", "strength training", "yoga", "first aid", "allergies", "the common cold",
    "dental care", "stress", "parenting", "pets", "adopting a dog", "houseplants", "cooking rice", "fermentation",
    "chocolate", "spices", "vegetarian cooking", "food waste", "water scarcity", "wind turbines", "solar panels",
    "batteries", "electricity", "magnets", "gravity", "light", "sound", "temperature", "weather forecasts",
    "hurricanes", "tornadoes", "the ozone layer", "the carbon cycle", "soil", "bees and pollination", "forests",
    "national parks", "camping", "travelling on a budget", "packing for a trip", "museums", "libraries",
    "volunteering", "elections", "human rights", "the United Nations", "trade", "currencies", "cryptocurrency",
    "smartphones", "screen time", "artificial intelligence ethics", "self-driving cars", "drones", "robots",
    "space exploration", "Mars", "exoplanets", "telescopes", "the Big Bang", "time zones", "calendars",
    "maps", "GPS", "languages of the world", "sign language", "poetry", "novels", "fairy tales", "mythology",
    "Greek philosophy", "stoicism", "logic", "critical thinking", "the scientific method", "memory", "dreams",
    "emotions", "motivation", "creativity", "architecture", "bridges", "skyscrapers", "cities", "villages",
    "farming", "fishing", "the textile industry", "fashion", "shoes", "the history of medicine", "hospitals",
]
AUDIENCES = ["a ten-year-old", "a busy professional", "a university student", "my grandmother", "a beginner",
             "an expert", "a high-school class", "a curious teenager"]
CHAT_FORMS = [
    "Explain {t} to {a}.", "Write a short essay about {t}.", "List five facts about {t}.", "Write a poem about {t}.",
    "What are the pros and cons of {t}?", "Write a short story involving {t}.",
    "Give me three questions to test my understanding of {t}, with answers.",
    "Describe the history of {t} in a few paragraphs.", "What are common misconceptions about {t}?",
    "Write an email to a friend recommending they learn about {t}.", "Write a blog post introduction about {t}.",
    "I'm giving a five-minute talk on {t} to {a}. Can you outline it?", "Summarise the key ideas of {t} in bullet points.",
    "Compare {t} and {u}. How are they similar and different?", "How is {t} related to {u}?",
    "Write a dialogue between two friends arguing about {t}.", "Create a study plan for learning about {t} in two weeks.",
    "What would the world be like without {t}?", "Write a limerick about {t}.", "Give me a fun analogy for {t}.",
    "What careers involve {t}?", "Write a product description for a board game about {t}.",
    "What are the most important open questions about {t}?", "Write a tweet thread (five tweets) about {t}.",
    "Can you recommend how {a} could get started with {t}?", "Write a quiz of five multiple-choice questions on {t}.",
    "Explain {t} using only simple words.", "Write a persuasive paragraph arguing that everyone should know about {t}.",
    "What is a surprising fact about {t}? Explain why it is true.", "Write a news headline and short article about {t}.",
    "Write the opening paragraph of a mystery novel in which {t} plays a part.", "Give me a step-by-step guide related to {t}.",
    "How has {t} changed over the last hundred years?", "Write a haiku sequence (three haiku) about {t}.",
    "What would a skeptic say about {t}, and how would you answer?", "Draft a lesson plan on {t} for {a}.",
    "I don't understand {t}. Can you help?", "Tell me a short, funny story about {t}.",
    "What ethical questions does {t} raise?", "Make a list of ten words related to {t} and define each.",
]
ADVICE = [
    "How can I stay focused when working from home?", "What should I consider when buying a used car?",
    "How do I politely decline an invitation?", "Give me tips for a job interview tomorrow.",
    "How can I make my morning routine more productive?", "What's a good way to start running as a beginner?",
    "How do I write a good cover letter?", "How can I save money on groceries?",
    "What should I pack for a week-long hiking trip?", "How do I apologise to a friend I upset?",
    "How can I improve my handwriting?", "What are good habits for better sleep?",
    "How do I ask my manager for a raise?", "How can I make new friends in a new city?",
    "How do I keep a conversation going on a first date?", "What is a healthy weekly meal plan on a budget?",
]


def chat_request(rng: random.Random) -> str:
    if rng.random() < 0.06:
        return rng.choice(ADVICE)
    t, u = rng.sample(TOPICS, 2)
    return rng.choice(CHAT_FORMS).format(t=t, u=u, a=rng.choice(AUDIENCES))


FOLLOW_UPS = [
    "Can you make that shorter?", "Can you explain that in simpler terms?", "Give me a concrete example.",
    "Now summarise your answer in three bullet points.", "What would be a common mistake here?",
    "Can you say more about the second point?", "Rewrite your answer as a short poem.",
    "How would you explain this to a ten-year-old?", "Are there any exceptions to this?", "Why is that?",
    "Can you turn that into a checklist?", "What should I read next to learn more?",
    "Translate your answer into French.", "Now write it in a more formal tone.", "What are the counter-arguments?",
    "Can you give me a harder version of this?", "Thanks! Can you check your answer for mistakes?",
    "How would this be different in the past?", "Write a one-sentence summary.", "Give me three follow-up questions.",
]


def follow_up(rng: random.Random) -> str:
    return rng.choice(FOLLOW_UPS)
