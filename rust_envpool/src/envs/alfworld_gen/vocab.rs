//! The generator's vocabulary: ALFWorld object classes, receptacle classes, what holds what, and
//! which classes appear in which room. These are pcsd's own tables, written from the ALFRED
//! domain's rules (`canContain`, `openable`, the object affordances) and from reading the public
//! ALFWorld games; no game instance is embedded.

use super::Room;

/// Every ALFRED object class, in the order the official problems declare them as constants
/// (`SaltShaker - object` ... and the matching `...Type - otype` list).
pub const OBJECT_CLASSES: [&str; 79] = [
    "SaltShaker",
    "HousePlant",
    "Candle",
    "SprayBottle",
    "Bowl",
    "Window",
    "CD",
    "Egg",
    "Glassbottle",
    "Sink",
    "Pillow",
    "Spoon",
    "SoapBottle",
    "TeddyBear",
    "ButterKnife",
    "Cup",
    "Plate",
    "RemoteControl",
    "Tomato",
    "Statue",
    "HandTowel",
    "Knife",
    "StoveKnob",
    "LightSwitch",
    "Pen",
    "Painting",
    "DishSponge",
    "Vase",
    "Mug",
    "ToiletPaper",
    "Box",
    "Mirror",
    "Ladle",
    "Fork",
    "Blinds",
    "Footstool",
    "KeyChain",
    "Cloth",
    "Laptop",
    "TissueBox",
    "PepperShaker",
    "FloorLamp",
    "WateringCan",
    "Apple",
    "Pan",
    "PaperTowel",
    "PaperTowelRoll",
    "Newspaper",
    "Television",
    "Chair",
    "CellPhone",
    "CreditCard",
    "Lettuce",
    "BasketBall",
    "Potato",
    "Curtains",
    "Boots",
    "Pencil",
    "AlarmClock",
    "ToiletPaperRoll",
    "Spatula",
    "Book",
    "Bread",
    "SoapBar",
    "Watch",
    "DeskLamp",
    "Kettle",
    "Pot",
    "ScrubBrush",
    "WineBottle",
    "ShowerDoor",
    "Bathtub",
    "LaundryHamperLid",
    "ShowerGlass",
    "Poster",
    "TennisRacket",
    "BaseballBat",
    "Towel",
    "Plunger",
];

/// Every ALFRED receptacle class, in the order the official problems declare `...Type - rtype`.
pub const RECEPTACLE_CLASSES: [&str; 30] = [
    "Safe",
    "Drawer",
    "CoffeeMachine",
    "HandTowelHolder",
    "SinkBasin",
    "Dresser",
    "LaundryHamper",
    "TVStand",
    "BathtubBasin",
    "Cabinet",
    "Fridge",
    "Desk",
    "Toilet",
    "Cart",
    "SideTable",
    "Sofa",
    "CoffeeTable",
    "DiningTable",
    "CounterTop",
    "GarbageCan",
    "ArmChair",
    "Shelf",
    "Microwave",
    "Toaster",
    "Bed",
    "PaintingHanger",
    "TowelHolder",
    "ToiletPaperHanger",
    "StoveBurner",
    "Ottoman",
];

// Affordance bits of an object class.
pub const PICK: u8 = 1; // pickupable
pub const CLEAN: u8 = 2; // cleanable (in a sink basin)
pub const HEAT: u8 = 4; // heatable (in the microwave)
pub const COOL: u8 = 8; // coolable (in the fridge)
pub const SLICE: u8 = 16; // sliceable
pub const RECOBJ: u8 = 32; // isReceptacleObject (bowls, mugs, pans...)
pub const TOGGLE: u8 = 64; // toggleable (desk lamp)

/// A movable object class: its affordances and the rooms it is found in.
#[derive(Debug, Clone, Copy)]
pub struct ObjClass {
    pub name: &'static str,
    pub flags: u8,
    pub rooms: &'static [Room],
}

use Room::{Bathroom as BA, Bedroom as BE, Kitchen as KI, LivingRoom as LI};

/// Objects that sit in receptacles and can be picked up (task targets and distractors).
pub const OBJECTS: &[ObjClass] = &[
    ObjClass {
        name: "AlarmClock",
        flags: PICK,
        rooms: &[BE],
    },
    ObjClass {
        name: "Apple",
        flags: PICK | CLEAN | HEAT | COOL | SLICE,
        rooms: &[KI],
    },
    ObjClass {
        name: "Book",
        flags: PICK,
        rooms: &[BE, LI, KI],
    },
    ObjClass {
        name: "Bowl",
        flags: PICK | RECOBJ | CLEAN | COOL,
        rooms: &[KI, BE, LI],
    },
    ObjClass {
        name: "Box",
        flags: PICK | RECOBJ,
        rooms: &[BE, LI],
    },
    ObjClass {
        name: "Bread",
        flags: PICK | HEAT | COOL | SLICE,
        rooms: &[KI],
    },
    ObjClass {
        name: "ButterKnife",
        flags: PICK | CLEAN,
        rooms: &[KI],
    },
    ObjClass {
        name: "CD",
        flags: PICK,
        rooms: &[BE],
    },
    ObjClass {
        name: "Candle",
        flags: PICK,
        rooms: &[BA, LI],
    },
    ObjClass {
        name: "CellPhone",
        flags: PICK,
        rooms: &[BE, LI, KI],
    },
    ObjClass {
        name: "Cloth",
        flags: PICK | CLEAN,
        rooms: &[BA, BE],
    },
    ObjClass {
        name: "CreditCard",
        flags: PICK,
        rooms: &[BE, LI, KI],
    },
    ObjClass {
        name: "Cup",
        flags: PICK | RECOBJ | CLEAN | HEAT | COOL,
        rooms: &[KI],
    },
    ObjClass {
        name: "DishSponge",
        flags: PICK | CLEAN,
        rooms: &[KI, BA],
    },
    ObjClass {
        name: "Egg",
        flags: PICK | CLEAN | HEAT | COOL | SLICE,
        rooms: &[KI],
    },
    ObjClass {
        name: "Fork",
        flags: PICK | CLEAN,
        rooms: &[KI],
    },
    ObjClass {
        name: "Glassbottle",
        flags: PICK,
        rooms: &[KI],
    },
    ObjClass {
        name: "HandTowel",
        flags: PICK,
        rooms: &[BA],
    },
    ObjClass {
        name: "Kettle",
        flags: PICK | CLEAN,
        rooms: &[KI],
    },
    ObjClass {
        name: "KeyChain",
        flags: PICK,
        rooms: &[BE, LI],
    },
    ObjClass {
        name: "Knife",
        flags: PICK | CLEAN,
        rooms: &[KI],
    },
    ObjClass {
        name: "Ladle",
        flags: PICK | CLEAN,
        rooms: &[KI],
    },
    ObjClass {
        name: "Laptop",
        flags: PICK,
        rooms: &[BE, LI],
    },
    ObjClass {
        name: "Lettuce",
        flags: PICK | CLEAN | COOL | SLICE,
        rooms: &[KI],
    },
    ObjClass {
        name: "Mug",
        flags: PICK | RECOBJ | CLEAN | HEAT | COOL,
        rooms: &[KI, BE],
    },
    ObjClass {
        name: "Newspaper",
        flags: PICK,
        rooms: &[LI],
    },
    ObjClass {
        name: "Pan",
        flags: PICK | RECOBJ | CLEAN | COOL,
        rooms: &[KI],
    },
    ObjClass {
        name: "Pen",
        flags: PICK,
        rooms: &[BE, LI, KI],
    },
    ObjClass {
        name: "Pencil",
        flags: PICK,
        rooms: &[BE, LI, KI],
    },
    ObjClass {
        name: "PepperShaker",
        flags: PICK,
        rooms: &[KI],
    },
    ObjClass {
        name: "Pillow",
        flags: PICK,
        rooms: &[BE, LI],
    },
    ObjClass {
        name: "Plate",
        flags: PICK | RECOBJ | CLEAN | HEAT | COOL,
        rooms: &[KI, LI],
    },
    ObjClass {
        name: "Pot",
        flags: PICK | RECOBJ | CLEAN | COOL,
        rooms: &[KI],
    },
    ObjClass {
        name: "Potato",
        flags: PICK | CLEAN | HEAT | COOL | SLICE,
        rooms: &[KI],
    },
    ObjClass {
        name: "RemoteControl",
        flags: PICK,
        rooms: &[LI, BE],
    },
    ObjClass {
        name: "SaltShaker",
        flags: PICK,
        rooms: &[KI],
    },
    ObjClass {
        name: "SoapBar",
        flags: PICK | CLEAN,
        rooms: &[BA],
    },
    ObjClass {
        name: "SoapBottle",
        flags: PICK,
        rooms: &[KI, BA],
    },
    ObjClass {
        name: "Spatula",
        flags: PICK | CLEAN,
        rooms: &[KI],
    },
    ObjClass {
        name: "Spoon",
        flags: PICK | CLEAN,
        rooms: &[KI],
    },
    ObjClass {
        name: "SprayBottle",
        flags: PICK,
        rooms: &[BA, KI],
    },
    ObjClass {
        name: "Statue",
        flags: PICK,
        rooms: &[LI, KI, BE],
    },
    ObjClass {
        name: "TissueBox",
        flags: PICK,
        rooms: &[BE, LI, BA],
    },
    ObjClass {
        name: "ToiletPaper",
        flags: PICK,
        rooms: &[BA],
    },
    ObjClass {
        name: "Tomato",
        flags: PICK | CLEAN | HEAT | COOL | SLICE,
        rooms: &[KI],
    },
    ObjClass {
        name: "Towel",
        flags: PICK,
        rooms: &[BA],
    },
    ObjClass {
        name: "Vase",
        flags: PICK,
        rooms: &[KI, LI, BE],
    },
    ObjClass {
        name: "Watch",
        flags: PICK,
        rooms: &[LI, BE],
    },
    ObjClass {
        name: "WateringCan",
        flags: PICK,
        rooms: &[LI],
    },
    ObjClass {
        name: "WineBottle",
        flags: PICK | COOL,
        rooms: &[KI],
    },
];

/// The light source of `look_at_obj_in_light`: a toggleable lamp standing on a receptacle.
pub const DESK_LAMP: ObjClass = ObjClass {
    name: "DeskLamp",
    flags: TOGGLE,
    rooms: &[BE, LI],
};
/// Receptacle classes a desk lamp may stand on.
pub const LAMP_HOSTS: &[&str] = &["Desk", "SideTable", "Dresser", "Shelf", "CoffeeTable"];

/// Fixed scenery: objects with a place in the room but no receptacle (not takeable). They do not
/// show in receptacle listings; they make the problem read like a real scene.
pub struct Decor {
    pub name: &'static str,
    pub rooms: &'static [Room],
    pub max: usize,
}

pub const DECOR: &[Decor] = &[
    Decor {
        name: "LightSwitch",
        rooms: &[KI, LI, BE, BA],
        max: 1,
    },
    Decor {
        name: "Window",
        rooms: &[KI, LI, BE, BA],
        max: 3,
    },
    Decor {
        name: "Chair",
        rooms: &[KI, LI, BE],
        max: 3,
    },
    Decor {
        name: "Painting",
        rooms: &[LI, BE],
        max: 3,
    },
    Decor {
        name: "Mirror",
        rooms: &[BA, BE],
        max: 1,
    },
    Decor {
        name: "Blinds",
        rooms: &[BE, KI],
        max: 2,
    },
    Decor {
        name: "Curtains",
        rooms: &[LI],
        max: 1,
    },
    Decor {
        name: "ShowerDoor",
        rooms: &[BA],
        max: 1,
    },
];

/// A receptacle class: whether it opens, its height band (metres) and what it may contain.
pub struct RecClass {
    pub name: &'static str,
    /// Probability that an instance is openable (1.0: always, 0.0: never).
    pub openable: f64,
    pub y: (f64, f64),
    pub contains: &'static [&'static str],
}

pub const RECEPTACLES: &[RecClass] = &[
    RecClass {
        name: "ArmChair",
        openable: 0.0,
        y: (0.0, 0.0),
        contains: &[
            "Book",
            "Box",
            "CellPhone",
            "Cloth",
            "CreditCard",
            "KeyChain",
            "Laptop",
            "Newspaper",
            "Pillow",
            "RemoteControl",
        ],
    },
    RecClass {
        name: "BathtubBasin",
        openable: 0.0,
        y: (0.20, 0.45),
        contains: &["Cloth", "DishSponge", "HandTowel", "SoapBar"],
    },
    RecClass {
        name: "Bed",
        openable: 0.0,
        y: (0.0, 0.0),
        contains: &[
            "BaseballBat",
            "BasketBall",
            "Book",
            "CellPhone",
            "Laptop",
            "Pillow",
            "TennisRacket",
        ],
    },
    RecClass {
        name: "Cabinet",
        openable: 0.85,
        y: (0.30, 2.10),
        contains: &[
            "Book",
            "Bowl",
            "Box",
            "CD",
            "Candle",
            "Cloth",
            "Cup",
            "DishSponge",
            "Glassbottle",
            "HandTowel",
            "Kettle",
            "Ladle",
            "Mug",
            "Newspaper",
            "Pan",
            "PepperShaker",
            "Plate",
            "Plunger",
            "Pot",
            "SaltShaker",
            "SoapBar",
            "SoapBottle",
            "SprayBottle",
            "TissueBox",
            "ToiletPaper",
            "Vase",
            "WateringCan",
            "WineBottle",
        ],
    },
    RecClass {
        name: "Cart",
        openable: 0.0,
        y: (0.0, 0.0),
        contains: &[
            "Candle",
            "Cloth",
            "DishSponge",
            "HandTowel",
            "Plunger",
            "SoapBar",
            "SoapBottle",
            "SprayBottle",
            "TissueBox",
            "ToiletPaper",
        ],
    },
    RecClass {
        name: "CoffeeMachine",
        openable: 0.0,
        y: (0.85, 0.95),
        contains: &["Mug"],
    },
    RecClass {
        name: "CoffeeTable",
        openable: 0.0,
        y: (0.0, 0.0),
        contains: &[
            "Book",
            "Bowl",
            "Box",
            "Candle",
            "CellPhone",
            "CreditCard",
            "KeyChain",
            "Laptop",
            "Newspaper",
            "Pen",
            "Pencil",
            "Plate",
            "RemoteControl",
            "Statue",
            "TissueBox",
            "Vase",
            "Watch",
            "WateringCan",
        ],
    },
    RecClass {
        name: "CounterTop",
        openable: 0.0,
        y: (0.90, 1.00),
        contains: &[
            "AlarmClock",
            "Apple",
            "Book",
            "Bowl",
            "Bread",
            "ButterKnife",
            "CD",
            "Candle",
            "CellPhone",
            "Cloth",
            "CreditCard",
            "Cup",
            "DishSponge",
            "Egg",
            "Fork",
            "Glassbottle",
            "HandTowel",
            "Kettle",
            "KeyChain",
            "Knife",
            "Ladle",
            "Laptop",
            "Lettuce",
            "Mug",
            "Pan",
            "Pen",
            "Pencil",
            "PepperShaker",
            "Plate",
            "Pot",
            "Potato",
            "RemoteControl",
            "SaltShaker",
            "SoapBar",
            "SoapBottle",
            "Spatula",
            "Spoon",
            "SprayBottle",
            "Statue",
            "TissueBox",
            "ToiletPaper",
            "Tomato",
            "Vase",
            "WineBottle",
        ],
    },
    RecClass {
        name: "Desk",
        openable: 0.0,
        y: (0.0, 0.0),
        contains: &[
            "AlarmClock",
            "BasketBall",
            "Book",
            "Bowl",
            "Box",
            "CD",
            "CellPhone",
            "Cloth",
            "CreditCard",
            "KeyChain",
            "Laptop",
            "Mug",
            "Pen",
            "Pencil",
            "RemoteControl",
            "Statue",
            "TennisRacket",
            "TissueBox",
            "Vase",
            "Watch",
            "WateringCan",
        ],
    },
    RecClass {
        name: "DiningTable",
        openable: 0.0,
        y: (0.0, 0.70),
        contains: &[
            "AlarmClock",
            "Apple",
            "BaseballBat",
            "BasketBall",
            "Book",
            "Bowl",
            "Box",
            "Bread",
            "ButterKnife",
            "CD",
            "Candle",
            "CellPhone",
            "Cloth",
            "CreditCard",
            "Cup",
            "DishSponge",
            "Egg",
            "Fork",
            "Glassbottle",
            "Kettle",
            "KeyChain",
            "Knife",
            "Ladle",
            "Laptop",
            "Lettuce",
            "Mug",
            "Newspaper",
            "Pan",
            "Pen",
            "Pencil",
            "PepperShaker",
            "Plate",
            "Pot",
            "Potato",
            "RemoteControl",
            "SaltShaker",
            "SoapBottle",
            "Spatula",
            "Spoon",
            "SprayBottle",
            "Statue",
            "TennisRacket",
            "TissueBox",
            "Tomato",
            "Vase",
            "Watch",
            "WateringCan",
            "WineBottle",
        ],
    },
    RecClass {
        name: "Drawer",
        openable: 0.85,
        y: (0.10, 1.05),
        contains: &[
            "Book",
            "ButterKnife",
            "CD",
            "Candle",
            "CellPhone",
            "Cloth",
            "CreditCard",
            "DishSponge",
            "Fork",
            "HandTowel",
            "KeyChain",
            "Knife",
            "Ladle",
            "Newspaper",
            "Pen",
            "Pencil",
            "PepperShaker",
            "RemoteControl",
            "SaltShaker",
            "SoapBar",
            "SoapBottle",
            "Spatula",
            "Spoon",
            "SprayBottle",
            "TissueBox",
            "ToiletPaper",
            "Watch",
            "WateringCan",
        ],
    },
    RecClass {
        name: "Dresser",
        openable: 0.0,
        y: (0.0, 0.0),
        contains: &[
            "AlarmClock",
            "BasketBall",
            "Book",
            "Bowl",
            "Box",
            "CD",
            "Candle",
            "CellPhone",
            "Cloth",
            "CreditCard",
            "KeyChain",
            "Laptop",
            "Mug",
            "Newspaper",
            "Pen",
            "Pencil",
            "Plate",
            "RemoteControl",
            "SprayBottle",
            "Statue",
            "TennisRacket",
            "TissueBox",
            "ToiletPaper",
            "Vase",
            "Watch",
            "WateringCan",
        ],
    },
    RecClass {
        name: "Fridge",
        openable: 1.0,
        y: (0.0, 0.0),
        contains: &[
            "Apple",
            "Bowl",
            "Bread",
            "Cup",
            "Egg",
            "Glassbottle",
            "Lettuce",
            "Mug",
            "Pan",
            "Plate",
            "Pot",
            "Potato",
            "Tomato",
            "WineBottle",
        ],
    },
    RecClass {
        name: "GarbageCan",
        openable: 0.0,
        y: (0.0, 0.0),
        contains: &[
            "Apple",
            "Bread",
            "CD",
            "Cloth",
            "DishSponge",
            "Egg",
            "HandTowel",
            "Lettuce",
            "Newspaper",
            "Pen",
            "Pencil",
            "Potato",
            "SoapBar",
            "SoapBottle",
            "SprayBottle",
            "TissueBox",
            "ToiletPaper",
            "Tomato",
            "WineBottle",
        ],
    },
    RecClass {
        name: "HandTowelHolder",
        openable: 0.0,
        y: (1.40, 1.75),
        contains: &["HandTowel"],
    },
    RecClass {
        name: "LaundryHamper",
        openable: 0.0,
        y: (0.0, 0.0),
        contains: &["Cloth"],
    },
    RecClass {
        name: "Microwave",
        openable: 1.0,
        y: (0.85, 1.70),
        contains: &[
            "Apple",
            "Bowl",
            "Bread",
            "Cup",
            "Egg",
            "Glassbottle",
            "Mug",
            "Plate",
            "Potato",
            "Tomato",
        ],
    },
    RecClass {
        name: "Ottoman",
        openable: 0.0,
        y: (0.0, 0.0),
        contains: &[
            "Book",
            "Box",
            "CellPhone",
            "CreditCard",
            "KeyChain",
            "Laptop",
            "Newspaper",
            "Pillow",
            "RemoteControl",
        ],
    },
    RecClass {
        name: "Safe",
        openable: 1.0,
        y: (0.0, 0.30),
        contains: &["CD", "CellPhone", "CreditCard", "KeyChain", "Statue", "Vase", "Watch"],
    },
    RecClass {
        name: "Shelf",
        openable: 0.0,
        y: (0.15, 1.80),
        contains: &[
            "AlarmClock",
            "Book",
            "Bowl",
            "Box",
            "CD",
            "Candle",
            "CellPhone",
            "Cloth",
            "CreditCard",
            "Cup",
            "DishSponge",
            "Glassbottle",
            "HandTowel",
            "Kettle",
            "KeyChain",
            "Mug",
            "Newspaper",
            "Pen",
            "Pencil",
            "PepperShaker",
            "Plate",
            "Pot",
            "RemoteControl",
            "SaltShaker",
            "SoapBar",
            "SoapBottle",
            "SprayBottle",
            "Statue",
            "TissueBox",
            "ToiletPaper",
            "Vase",
            "Watch",
            "WateringCan",
            "WineBottle",
        ],
    },
    RecClass {
        name: "SideTable",
        openable: 0.0,
        y: (0.0, 0.0),
        contains: &[
            "AlarmClock",
            "Apple",
            "BaseballBat",
            "BasketBall",
            "Book",
            "Bowl",
            "Box",
            "Bread",
            "ButterKnife",
            "CD",
            "Candle",
            "CellPhone",
            "Cloth",
            "CreditCard",
            "Cup",
            "DishSponge",
            "Egg",
            "Fork",
            "HandTowel",
            "Kettle",
            "KeyChain",
            "Knife",
            "Laptop",
            "Lettuce",
            "Mug",
            "Newspaper",
            "Pan",
            "Pen",
            "Pencil",
            "PepperShaker",
            "Plate",
            "Pot",
            "Potato",
            "RemoteControl",
            "SaltShaker",
            "SoapBar",
            "SoapBottle",
            "Spatula",
            "Spoon",
            "SprayBottle",
            "Statue",
            "TennisRacket",
            "TissueBox",
            "ToiletPaper",
            "Tomato",
            "Vase",
            "Watch",
            "WateringCan",
            "WineBottle",
        ],
    },
    RecClass {
        name: "SinkBasin",
        openable: 0.0,
        y: (0.75, 0.95),
        contains: &[
            "Apple",
            "Bowl",
            "ButterKnife",
            "Cloth",
            "Cup",
            "DishSponge",
            "Egg",
            "Fork",
            "Glassbottle",
            "HandTowel",
            "Kettle",
            "Knife",
            "Ladle",
            "Lettuce",
            "Mug",
            "Pan",
            "Plate",
            "Pot",
            "Potato",
            "SoapBar",
            "Spatula",
            "Spoon",
            "Tomato",
        ],
    },
    RecClass {
        name: "Sofa",
        openable: 0.0,
        y: (0.0, 0.0),
        contains: &[
            "Book",
            "Box",
            "CellPhone",
            "CreditCard",
            "KeyChain",
            "Laptop",
            "Newspaper",
            "Pillow",
            "RemoteControl",
        ],
    },
    RecClass {
        name: "StoveBurner",
        openable: 0.0,
        y: (0.85, 0.95),
        contains: &["Kettle", "Pan", "Pot"],
    },
    RecClass {
        name: "TVStand",
        openable: 0.0,
        y: (0.0, 0.0),
        contains: &["TissueBox"],
    },
    RecClass {
        name: "Toaster",
        openable: 0.0,
        y: (0.85, 0.95),
        contains: &[],
    },
    RecClass {
        name: "Toilet",
        openable: 0.0,
        y: (0.0, 0.10),
        contains: &[
            "Candle",
            "Cloth",
            "DishSponge",
            "HandTowel",
            "SoapBar",
            "SoapBottle",
            "SprayBottle",
            "TissueBox",
            "ToiletPaper",
        ],
    },
    RecClass {
        name: "ToiletPaperHanger",
        openable: 0.0,
        y: (0.60, 1.10),
        contains: &["ToiletPaper"],
    },
    RecClass {
        name: "TowelHolder",
        openable: 0.0,
        y: (1.00, 1.60),
        contains: &["Towel"],
    },
];

/// Where objects of a class are usually kept (the generator's `usual_place` knob): a fixed,
/// type-level convention of the generated houses (like "keychains are kept in dressers"), used
/// only where the room has that receptacle class and it may hold the object. Objects not listed
/// have no usual place. Every entry is a receptacle class that may contain the object (tested).
pub const USUAL_PLACES: &[(&str, &str)] = &[
    ("AlarmClock", "SideTable"),
    ("Book", "Shelf"),
    ("Bowl", "Cabinet"),
    ("Box", "ArmChair"),
    ("CD", "Drawer"),
    ("Candle", "Cabinet"),
    ("CellPhone", "Drawer"),
    ("Cloth", "Dresser"),
    ("CreditCard", "Safe"),
    ("KeyChain", "Dresser"),
    ("Laptop", "ArmChair"),
    ("Mug", "Shelf"),
    ("Newspaper", "Cabinet"),
    ("Pen", "Drawer"),
    ("Pencil", "DiningTable"),
    ("Pillow", "ArmChair"),
    ("Plate", "Shelf"),
    ("RemoteControl", "SideTable"),
    ("Statue", "Shelf"),
    ("TissueBox", "Dresser"),
    ("Vase", "Cabinet"),
    ("Watch", "Safe"),
    ("WateringCan", "Cabinet"),
];

/// The usual place of an object class ([`USUAL_PLACES`]), if it has one.
pub fn usual_place(oclass: &str) -> Option<&'static str> {
    USUAL_PLACES.iter().find(|(o, _)| *o == oclass).map(|(_, r)| *r)
}

/// Receptacle classes that can also hold a desk lamp (which is not in any `canContain` list: it
/// never moves).
pub fn can_host_lamp(rclass: &str) -> bool {
    LAMP_HOSTS.contains(&rclass)
}

pub fn rec_class(name: &str) -> &'static RecClass {
    RECEPTACLES
        .iter()
        .find(|r| r.name == name)
        .unwrap_or_else(|| panic!("unknown receptacle class {name}"))
}

pub fn obj_class(name: &str) -> Option<&'static ObjClass> {
    OBJECTS.iter().find(|o| o.name == name)
}

pub fn can_contain(rclass: &str, oclass: &str) -> bool {
    rec_class(rclass).contains.contains(&oclass)
}

/// How many receptacles of a class a room has: (class, min, max, weight when adding more).
pub type RoomSlot = (&'static str, usize, usize, u32);

pub struct RoomSpec {
    pub room: Room,
    pub slots: &'static [RoomSlot],
    /// Default range of the total receptacle count when the knob is not given.
    pub default_receptacles: (usize, usize),
    /// Default range of the number of distractor objects.
    pub default_distractors: (usize, usize),
}

pub const ROOMS: [RoomSpec; 4] = [
    RoomSpec {
        room: Room::Kitchen,
        slots: &[
            ("Cabinet", 1, 24, 10),
            ("CoffeeMachine", 1, 1, 0),
            ("CounterTop", 1, 4, 2),
            ("DiningTable", 0, 2, 2),
            ("Drawer", 0, 20, 7),
            ("Fridge", 1, 1, 0),
            ("GarbageCan", 1, 1, 0),
            ("Microwave", 1, 1, 0),
            ("Shelf", 0, 4, 1),
            ("SideTable", 0, 1, 1),
            ("SinkBasin", 1, 1, 0),
            ("StoveBurner", 1, 6, 3),
            ("Toaster", 0, 1, 3),
        ],
        default_receptacles: (14, 26),
        default_distractors: (14, 28),
    },
    RoomSpec {
        room: Room::LivingRoom,
        slots: &[
            ("ArmChair", 0, 3, 3),
            ("Cabinet", 0, 10, 2),
            ("CoffeeTable", 0, 2, 3),
            ("DiningTable", 0, 2, 2),
            ("Drawer", 0, 16, 4),
            ("Dresser", 0, 2, 2),
            ("GarbageCan", 1, 1, 0),
            ("Ottoman", 0, 1, 1),
            ("Safe", 0, 1, 1),
            ("Shelf", 0, 12, 3),
            ("SideTable", 0, 5, 3),
            ("Sofa", 1, 2, 1),
            ("TVStand", 0, 2, 2),
        ],
        default_receptacles: (8, 18),
        default_distractors: (8, 20),
    },
    RoomSpec {
        room: Room::Bedroom,
        slots: &[
            ("ArmChair", 0, 2, 1),
            ("Bed", 1, 2, 1),
            ("Cabinet", 0, 6, 1),
            ("Desk", 0, 2, 3),
            ("DiningTable", 0, 1, 1),
            ("Drawer", 1, 18, 6),
            ("Dresser", 0, 2, 3),
            ("GarbageCan", 1, 1, 0),
            ("LaundryHamper", 0, 1, 2),
            ("Safe", 0, 1, 1),
            ("Shelf", 0, 14, 4),
            ("SideTable", 0, 3, 3),
        ],
        default_receptacles: (8, 18),
        default_distractors: (8, 20),
    },
    RoomSpec {
        room: Room::Bathroom,
        slots: &[
            ("BathtubBasin", 0, 1, 3),
            ("Cabinet", 0, 12, 5),
            ("Cart", 0, 1, 1),
            ("CounterTop", 1, 2, 1),
            ("Drawer", 0, 12, 4),
            ("Dresser", 0, 1, 1),
            ("GarbageCan", 1, 1, 0),
            ("HandTowelHolder", 1, 3, 1),
            ("Shelf", 0, 6, 2),
            ("SideTable", 0, 1, 1),
            ("SinkBasin", 1, 2, 1),
            ("Toilet", 1, 1, 0),
            ("ToiletPaperHanger", 1, 1, 0),
            ("TowelHolder", 1, 2, 1),
        ],
        default_receptacles: (9, 16),
        default_distractors: (8, 18),
    },
];

pub fn room_spec(room: Room) -> &'static RoomSpec {
    ROOMS.iter().find(|s| s.room == room).expect("every room has a spec")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn usual_places_may_hold_their_objects() {
        for (o, r) in USUAL_PLACES {
            assert!(obj_class(o).is_some(), "{o} is an object class");
            assert!(can_contain(r, o), "{r} may hold {o}");
        }
    }

    #[test]
    fn tables_are_consistent() {
        for r in RECEPTACLES {
            assert!(RECEPTACLE_CLASSES.contains(&r.name), "{}", r.name);
            for o in r.contains {
                assert!(OBJECT_CLASSES.contains(o), "{o} in {}", r.name);
            }
        }
        for o in OBJECTS {
            assert!(OBJECT_CLASSES.contains(&o.name), "{}", o.name);
            // Every object class can be put somewhere that exists in one of its rooms.
            let placeable = o.rooms.iter().any(|room| {
                room_spec(*room)
                    .slots
                    .iter()
                    .any(|(rc, _, _, _)| can_contain(rc, o.name))
            });
            assert!(placeable, "{} has no receptacle in its rooms", o.name);
        }
        for d in DECOR {
            assert!(OBJECT_CLASSES.contains(&d.name));
        }
        for spec in &ROOMS {
            for (rc, lo, hi, _) in spec.slots {
                assert!(lo <= hi);
                let _ = rec_class(rc);
            }
        }
    }
}
